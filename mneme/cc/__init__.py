"""Building CUDA apps for mneme: the `mneme cc` compiler wrapper and the device IR it embeds."""
