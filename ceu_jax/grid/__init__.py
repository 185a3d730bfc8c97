"""The experiment grid: sweep expansion, a resumable sharded driver, aggregation, report."""
