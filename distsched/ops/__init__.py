"""Operations as generators: each yields the requests it needs and receives their
replies, so one body serves the sync and the asyncio scheduler."""
