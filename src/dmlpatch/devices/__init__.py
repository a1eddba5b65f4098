"""Where the device is chosen: device specs resolved, torch-directml loaded, the choice said."""
