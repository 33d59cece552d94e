package store

// ReadTxs counts the read transactions begun on the sandbox store's file.
func (n *Store) ReadTxs() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.store == nil {
		return 0
	}
	return n.store.db.Stats().TxN
}
