"""From the results store to answers: cells, break-even bandwidths, the performance model, the report.

Reads only the store (never logs), so a report can be rebuilt at any time.
"""
