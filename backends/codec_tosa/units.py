"""Units every report shares."""

MIB = float(1 << 20)  # bytes in a MiB: traffic and storage are reported in MiB
