"""Jobs from submission to their end: limits, submission, transitions, control, arrays and
dependencies, and the queue's pages and API."""
