"""Cache sets (prewarmed working sets) and the second origin."""
