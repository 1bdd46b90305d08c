package auditlog

// QueueDepth is the number of appended records waiting for the committer
// (not yet written), for the gateway's cmcp_audit_queue_depth metric. A
// depth that keeps growing means the disk cannot keep up.
func (w *Writer) QueueDepth() int { return len(w.in) }
