"""Reading input Parquet and writing results: everything that touches storage."""
