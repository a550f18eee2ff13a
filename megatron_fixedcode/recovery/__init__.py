"""Recovery: what happens when a rank, a launch or a node fails (Megatron-LM's ft_integration and beyond)."""
