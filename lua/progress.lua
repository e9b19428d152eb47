-- progress.lua: a running attempt reports its progress and/or saves a checkpoint.
--
--- @include run
--- @include limits
--- @include record
--- @include idle
--- @keys tasks meta progress checkpoints waits ended
--
-- No state changes. Fenced by the token (id, version, attempt): only the current
-- running attempt writes; any other token gets 'stale' and nothing is written (a
-- repeated report is simply applied again: it writes the same values). A progress
-- report (fraction in [0, 1] and a note) replaces the task's progress entry; a
-- checkpoint replaces the version's checkpoint, which the next attempts of the same
-- version read (a new version starts without one: a reader ignores an entry of
-- another version, and this script overwrites it). A report without one of the two
-- keeps what the entry holds of it for the same version. The lease is not extended
-- (that is heartbeat.lua's work).
--
-- progress entry: '<version> <attempt> <updated ms> <fraction|-> <checkpoint bytes|-> <note>'
-- (the attempt and time of the last report; '-' when the version reported no fraction,
-- or saved no checkpoint); checkpoints entry: 14 lowercase hex digits of the version,
-- then the checkpoint's bytes (a msgpack value; empty: none).
--
-- Reads tasks, meta (the test clock), waits; writes progress, checkpoints.
--
-- Publishes: 'progress <id>' on ended when a client waits for the task (it has a waits
-- entry, which stays): a waiter reads the task again and sees the new progress.
--
-- ARGV[1] task id
-- ARGV[2] version
-- ARGV[3] attempt
-- ARGV[4] fraction: a decimal number in [0, 1], or '' for no progress report
-- ARGV[5] note: UTF-8, at most MAX_PROGRESS_NOTE_BYTES (200) bytes; '' when ARGV[4] is ''
-- ARGV[6] '1' when a checkpoint follows, '0' for none
-- ARGV[7] (only with ARGV[6] '1') the checkpoint's bytes, at most MAX_CHECKPOINT_BYTES
--   (65536); '' clears it
--
-- Reply: { 0, outcome }, outcome 'applied' or 'stale'.
-- Errors: BADARG task_id ...; BADARG version ...; BADARG attempt ...; BADARG fraction ...;
-- BADARG note ...; BADARG checkpoint ...; BADARG ARGV ... (a wrong number of values).
-- Cost: O(1) (the checkpoint's bytes are copied once).

return run(function(c)
  if #ARGV ~= 6 and #ARGV ~= 7 then error({ err = 'BADARG ARGV expected 6 or 7 values' }) end
  local id = check_id(ARGV[1], 'task_id')
  local version = to_int(ARGV[2], 'version')
  local attempt = to_int(ARGV[3], 'attempt')
  if version < 0 or version > MAX_EXACT then error({ err = 'BADARG version out of range' }) end
  if attempt < 0 or attempt > MAX_EXACT then error({ err = 'BADARG attempt out of range' }) end
  local fraction, note = ARGV[4], ARGV[5]
  if fraction ~= '' then
    local f = #fraction <= 32 and string.match(fraction, '^[0-9.eE+-]+$') and tonumber(fraction)
    if not f or f ~= f or f < 0 or f > 1 then
      error({ err = 'BADARG fraction must be a number in [0, 1]' })
    end
  elseif note ~= '' then
    error({ err = 'BADARG note must come with a fraction' })
  end
  if #note > LIMITS.MAX_PROGRESS_NOTE_BYTES then
    error({ err = 'BADARG note must be at most ' .. LIMITS.MAX_PROGRESS_NOTE_BYTES
      .. ' bytes (MAX_PROGRESS_NOTE_BYTES)' })
  end
  if not valid_utf8(note) then error({ err = 'BADARG note must be valid UTF-8' }) end
  local saves = ARGV[6]
  if saves ~= '0' and saves ~= '1' then
    error({ err = 'BADARG checkpoint flag must be 0 or 1' })
  end
  if (saves == '1') ~= (#ARGV == 7) then
    error({ err = 'BADARG ARGV expected the checkpoint after a flag 1, none after 0' })
  end
  local checkpoint = ARGV[7]
  if checkpoint and #checkpoint > LIMITS.MAX_CHECKPOINT_BYTES then
    error({ err = 'BADARG checkpoint must be at most ' .. LIMITS.MAX_CHECKPOINT_BYTES
      .. ' bytes (MAX_CHECKPOINT_BYTES)' })
  end
  if fraction == '' and not checkpoint then
    error({ err = 'BADARG ARGV expected a fraction or a checkpoint' })
  end

  local t = load_task(id)
  if not (t and t.state == 'running' and t.version == version and t.attempt == attempt) then
    return { 0, 'stale' }
  end

  -- What the entry holds of this version that the report leaves as it is.
  local kept_fraction, kept_size, kept_note = '-', '-', ''
  local old = redis.call('HGET', k.progress, id)
  if old then
    local v, f, size, n = string.match(old, '^(%d+) %d+ %d+ (%S+) (%S+) (.*)$')
    if v and tonumber(v) == version then kept_fraction, kept_size, kept_note = f, size, n end
  end
  if fraction == '' then fraction, note = kept_fraction, kept_note end
  local size = kept_size
  if checkpoint then
    size = itoa(#checkpoint)
    redis.call('HSET', k.checkpoints, id, string.format('%014x', version) .. checkpoint)
  end
  redis.call('HSET', k.progress, id, itoa(version) .. ' ' .. itoa(attempt) .. ' '
    .. now_text(c) .. ' ' .. fraction .. ' ' .. size .. ' ' .. note)
  if redis.call('ZSCORE', k.waits, id) then publish(k.ended, 'progress ' .. id) end
  return { 0, 'applied' }
end)
