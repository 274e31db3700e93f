"""What a model directory holds on disk, for training and serving alike: its layout and
config files (`layout`), checkpoint averaging (`averaging`), the moving average of the
weights (`ema`), which weights an export ships (`weights`), and writes of whole files
and directories (`files`). Training writes the directory and serving reads it; both
import this package, which imports neither."""
