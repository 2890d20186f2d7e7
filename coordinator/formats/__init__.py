"""The record formats: the xid, branch and stream records and their JSON (``records``),
the state tables every change is checked against (``states``), and the names of the
steps a decided xid passes (``steps``). They import nothing of the coordinator but its
errors."""
