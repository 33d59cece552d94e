package events

// sandboxCreatedV1 is sandbox.created as schema 1 wrote it: one OS disk path
// and nothing else. Schema 2 lists every owned resource by kind, so the
// ownership projection can attribute sockets, intents and state dirs too.
type sandboxCreatedV1 struct {
	Handle string `msgpack:"handle,omitempty"`
	Image  string `msgpack:"image"`
	Driver string `msgpack:"driver"`
	Disk   string `msgpack:"disk"`
}

func upcastSandboxCreatedV1(raw []byte) (Payload, error) {
	var old sandboxCreatedV1
	if err := StrictUnmarshal(raw, &old); err != nil {
		return nil, err
	}
	p := SandboxCreatedEvent{Handle: old.Handle, Image: old.Image, Driver: old.Driver}
	if old.Disk != "" {
		p.Resources = []Resource{{Kind: KindRawDisk, Path: old.Disk}}
	}
	return p, nil
}

// addedFields upcasts a schema that differs from the current one only by
// fields added since (sandbox.created v2, sandbox.forked v1 lack
// Bootstrap; sandbox.created v3, forked and restored v2 lack Boot;
// sandbox.created v4, forked and restored v3, volume.created v1 lack
// Labels; sandbox.created v5, forked and restored v4 lack Boot's Root):
// the old bytes decode strictly into the current type, and the
// new fields stay zero.
func addedFields[P Payload](raw []byte) (Payload, error) {
	var p P
	if err := StrictUnmarshal(raw, &p); err != nil {
		return nil, err
	}
	return p, nil
}
