# One JSON object per live data file, as the log names it
deltastream files events
