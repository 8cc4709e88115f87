"""The replay service (cloud): named tables of trajectory chunks, in the spirit of Reverb."""
