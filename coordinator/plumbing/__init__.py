"""The store plumbing: the node store protocol (``nodes``) and both stores that serve it
(kazoo as it is, and ``keepermap/``, kept here beside the protocol it implements so its
one import of ``nodes`` stays inside the wing), multi-ops, a sink's paths, reads inside
the retry policy, ZooKeeper ACLs and TLS."""
