package imagecache

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// qcow2Magic begins every qcow2 image (QEMU's qcow2 format: "QFI" 0xfb).
var qcow2Magic = []byte("QFI\xfb")

// CheckRaw refuses an image that is not a raw disk. Every disk is sent to
// the VMM as image_type Raw (CH then does not probe it, and QEMU is told
// format=raw), so a qcow2 image would boot as a disk holding qcow2's own
// bytes, with no filesystem the guest can mount: it is refused here, with
// the reason and the way out, before anything is written.
func CheckRaw(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	head := make([]byte, len(qcow2Magic))
	if _, err := io.ReadFull(f, head); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: read its header: %w", path, err)
	}
	if bytes.Equal(head, qcow2Magic) {
		return fmt.Errorf("%s is a qcow2 image; nexus boots raw images only (disks are sent to the VMM as image_type Raw): convert it with qemu-img convert -O raw %s IMAGE.raw", path, path)
	}
	return nil
}
