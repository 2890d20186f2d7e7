"""The upkeep of a sink's records: retention (removing finished xids, the summary of what
they wrote) and the audit that proves nothing illegal ever happened. The protocol's
commit and stream steps call retention, so this wing sits below the protocol."""
