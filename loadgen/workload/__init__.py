"""What is sent: conversations budgeted to exact counts, datasets, traces, images, arrival times. No I/O."""
