"""The plan of a program: calibration, the traffic model, what the plan records, and the analysis."""
