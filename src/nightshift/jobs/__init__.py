"""Jobs: the spec users write, planning a job, running it, and its report."""
