package auditlog

// QueueDepth is the number of appended records waiting for the committer
// (not yet written), for the gateway's cmcp_audit_queue_depth metric. A
// depth that keeps growing means the disk cannot keep up.
func (w *Writer) QueueDepth() int { return len(w.in) }

// AppendErrors is the number of appends that failed since Open (the
// record was not written), for the gateway's
// cmcp_audit_append_errors_total metric. An append given up because its
// ctx ended before the record was queued is not counted: the log did not
// fail.
func (w *Writer) AppendErrors() uint64 { return w.appendErrors.Load() }
