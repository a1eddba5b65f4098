"""What DirectML lacks: the operators torch-directml registers and the gaps it refuses or
sends to the CPU, as data shared by the simulated device and the on-device op fixes."""
