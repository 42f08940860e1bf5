"""Distributed training by hand: launching, the collectives benchmark, the DDP stages (ddp/)."""
