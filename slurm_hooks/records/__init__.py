"""Per-job records and what is made of them: counter snapshots, the record and its summary, the
store on disk, the fleet report and its straggler scan (slow nodes against their job's peers),
node_exporter metrics and dcgm-exporter's job mapping.
"""
