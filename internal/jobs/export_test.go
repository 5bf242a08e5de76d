package jobs

// SetCancelPage makes s's CancelTenant and CancelDeadOfTenant cancel pages of n jobs a
// statement (cancelPageSize otherwise): a test of many pages needs few jobs.
func SetCancelPage(s *Store, n int) { s.cancelPage = n }
