"""Everything about Slurm: the job's environment, gres.conf and cgroups, the client (scontrol or
pyslurm), policy (results -> verdict; drain reasons; outcomes), the drainer and the per-node lock,
and the fleet report's drains of straggler suspects.
"""
