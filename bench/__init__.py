"""tablequeue benchmarks (PostgreSQL): `python -m bench.run` (or `make bench`).

Everything runs against one throwaway embedded cluster (or TABLEQUEUE_PG_URL when set) in one run;
results go to docs/bench/results.json, plots to docs/bench/*.png and the report to docs/BENCHMARKS.md.
Numbers are measured, never asserted: nothing here fails because something was slow.
"""
