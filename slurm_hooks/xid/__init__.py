"""Everything about NVIDIA Xid/SXid reports: kernel log records and their line parsers (kmsg), and
what a code means (catalog: NVIDIA's Xid catalog, classification, `slurm-hooks explain`).
"""
