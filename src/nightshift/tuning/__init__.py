"""``jobs tune``: the job's operating point measured on a sample of its own records, each
candidate setting run on the real engine, its speed, cost and answers side by side."""
