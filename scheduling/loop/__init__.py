"""The central side's placement loop: snapshot, engine, decisions committed in batches, and
placed jobs dispatched to their nodes' agents."""
