"""Side-by-side benchmark of the gateway against the Tansu peer: `python -m bench --help`."""
