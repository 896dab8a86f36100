"""Reading the machine: Host (every read of /sys, /proc, /dev, rooted at a path), the procfs/sysfs text
parsers, CPU topology and times, the PCIe tree, NVML (the only module importing pynvml), capture.
"""
