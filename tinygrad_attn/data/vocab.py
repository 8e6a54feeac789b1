"""Token ids shared by the built-in sequence-to-sequence tasks.

    PAD = 0   padding (ignored by the loss and masked in attention)
    BOS = 1   start of the decoder input
    EOS = 2   end of the target sequence
    symbol s (0 <= s < num_symbols) has id s + 3

So a task with `num_symbols` symbols has a vocabulary of num_symbols + 3 ids.
"""
PAD, BOS, EOS = 0, 1, 2
NUM_SPECIAL = 3
SPECIAL_NAMES = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>"}
