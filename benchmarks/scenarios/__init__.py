"""One module per benchmark or on-demand check; ``python -m benchmarks NAME`` runs one."""
