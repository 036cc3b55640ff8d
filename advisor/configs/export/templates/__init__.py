"""Files the exporters copy verbatim (kept as a package so they ship inside the wheel)."""
