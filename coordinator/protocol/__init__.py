"""The protocol steps: the compare-and-set transitions (the decision is written there),
fencing, epochs, liveness, the publish lease and ledger, the callbacks, finishing a
decided xid, recovery and the stream record, as the two fronts call them."""
