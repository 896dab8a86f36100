"""Per-job records and what is made of them: counter snapshots, the record and its summary, the
store on disk, the fleet report, node_exporter metrics and dcgm-exporter's job mapping.
"""
