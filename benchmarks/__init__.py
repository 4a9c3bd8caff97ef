"""Side-by-side speed runs of our DDP against torch DDP and Lightning (`make bench`)."""
