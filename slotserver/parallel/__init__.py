"""Tensor parallelism over torch.distributed (`--tp N`; docs/scaling.md).

launch.py: the ranks (spawned on one machine, or from torchrun's environment) and the process
group; comm.py: the collectives a step makes; shard.py: each rank's slice of the weights;
leader.py: rank 0's hooks (each step's plan and KV-cache edits sent to the other ranks);
worker.py: the other ranks' loop (apply what rank 0 sends, run the forward only).
"""
