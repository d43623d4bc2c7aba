"""What a run came to: the report model, goodput, sweeps, and the table, JSON, CSV and HTML outputs."""
