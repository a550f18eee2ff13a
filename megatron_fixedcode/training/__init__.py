"""Training: model chunks under DDP, one forward/backward over microbatches, optimizer."""
