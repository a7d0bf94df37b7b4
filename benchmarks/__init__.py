"""``python -m benchmarks`` (``make bench``): each figure as one line, against a baseline of the same run."""
