package supervisor

// emptyTrash deletes what removals moved into the store's trash (store.TrashDir): at once,
// which takes what a crash left there, after each removal, and once more when the supervisor
// closes, which takes what the spares' deletion at Close moved there. A delete answers once
// its sandbox's entries are in the trash; this is where the file system frees them.
func (s *Supervisor) emptyTrash() {
	defer s.wg.Done()
	for {
		s.emptyTrashOnce()
		select {
		case <-s.store.Trashed():
		case <-s.life.Done():
			s.emptyTrashOnce()
			return
		}
	}
}

func (s *Supervisor) emptyTrashOnce() {
	n, err := s.store.EmptyTrash()
	if err != nil {
		// The next removal tries again, and so does bothyd check --repair.
		s.log.Warn("emptying the trash", "err", err)
	}
	if n > 0 {
		s.log.Debug("emptied the trash", "bins", n)
	}
}
