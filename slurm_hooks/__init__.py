"""slurm-hooks: Slurm prolog/epilog node checks for GPU clusters."""

__version__ = "0.1.0"
