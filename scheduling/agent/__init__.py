"""The node side: the agent's executor runs placed jobs, confined (isolation) and with their
MPS servers, and reports what became of them."""
