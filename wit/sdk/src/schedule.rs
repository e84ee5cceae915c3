//! Schedules (a backup every 6 h): durations such as `spec.backup.every`, the RFC 3339 times
//! status and Pods carry, and when the next scheduled run is due.
//!
//! A plugin has no clock but the observation's `now`, and no memory but the status: the
//! last scheduled run's due time is recorded there, and the next one is due `every`
//! after it. Due times advance by whole periods, so they do not drift with the time a
//! run takes; periods missed while the cluster was unreachable or the host was down are
//! skipped (one run, not a burst of catch-up ones).

/// Parses a duration such as `90s`, `30m`, `6h` or `1h30m` into seconds; `None` when it is
/// not one, or is zero.
pub fn parse_duration(text: &str) -> Option<i64> {
    let mut total: i64 = 0;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            _ => return None,
        };
        let n: i64 = digits.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        digits.clear();
    }
    (digits.is_empty() && total > 0).then_some(total)
}

/// Parses an RFC 3339 time as Kubernetes and this plugin write it
/// (`2024-05-01T12:00:00Z`, optionally with fractional seconds or a `±hh:mm` offset) into
/// seconds since the Unix epoch; `None` for anything else.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let text = text.trim();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if separators
        .iter()
        .any(|(at, want)| text.as_bytes().get(*at) != Some(want))
        || !matches!(text.as_bytes().get(10), Some(b'T' | b't' | b' '))
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Fractional seconds are dropped: schedules work in whole seconds.
    let mut rest = text.get(19..)?;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        rest = fraction.get(digits..)?;
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return None,
            };
            let (h, m) = rest.get(1..)?.split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            sign * (h.parse::<i64>().ok()? * 3_600 + m.parse::<i64>().ok()? * 60)
        }
    };
    // Days since 1970-01-01 from a civil date (Howard Hinnant's `days_from_civil`).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second - offset)
}

/// When the next scheduled run is due, in seconds: `every` after the last one was due,
/// or now when none was ever taken (or the recorded time does not parse).
pub fn next_due(last_due: Option<&str>, every: i64, now: i64) -> i64 {
    match last_due.and_then(parse_rfc3339) {
        Some(last) => last.saturating_add(every),
        None => now,
    }
}

/// The due time to record for a run started now, `due` being when it was due: `due`
/// itself, so the schedule keeps its phase; or now, when at least one whole period was
/// missed, so missed periods are skipped rather than caught up one after another.
pub fn due_time_to_record(due: i64, every: i64, now: i64) -> i64 {
    if now.saturating_sub(due) >= every {
        now
    } else {
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("6h", Some(21_600)),
            ("30m", Some(1_800)),
            ("90s", Some(90)),
            ("1h30m", Some(5_400)),
            (" 5s ", Some(5)),
            ("0s", None),
            ("6", None),
            ("h", None),
            ("6d", None),
            ("1.5h", None),
            ("-1h", None),
            ("", None),
            ("99999999999999999999h", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), want, "{text:?}");
        }
    }

    #[test]
    fn rfc3339_times() {
        let cases = [
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2024-05-01T12:00:00Z", Some(1_714_564_800)),
            ("2000-02-29T00:00:00Z", Some(951_782_400)),
            ("2024-05-01T12:00:00.123456Z", Some(1_714_564_800)),
            ("2024-05-01T14:00:00+02:00", Some(1_714_564_800)),
            ("2024-05-01T11:30:00-00:30", Some(1_714_564_800)),
            ("2024-05-01 12:00:00Z", Some(1_714_564_800)),
            ("2024-05-01T12:00:00", None),
            ("2024-13-01T12:00:00Z", None),
            ("2024-05-01T12:00Z", None),
            ("yesterday", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_rfc3339(text), want, "{text:?}");
        }
        // What the SDK writes reads back.
        let at = crate::Timestamp {
            seconds: 4_102_444_799,
            nanoseconds: 0,
        };
        assert_eq!(
            parse_rfc3339(&crate::conditions::rfc3339(at)),
            Some(4_102_444_799)
        );
    }

    #[test]
    fn schedule() {
        let t = |s: &str| parse_rfc3339(s).unwrap_or(-1);
        let noon = t("2024-05-01T12:00:00Z");
        // (situation, last due, now, next due, due time recorded if started now)
        let cases = [
            ("never taken: due now", None, noon, noon, noon),
            (
                "taken at 6:00, every 6h: due at noon",
                Some("2024-05-01T06:00:00Z"),
                noon - 10,
                noon,
                noon,
            ),
            (
                "started a little late: keeps the schedule's phase",
                Some("2024-05-01T06:00:00Z"),
                noon + 7,
                noon,
                noon,
            ),
            (
                "a whole period missed: one snapshot now, the schedule moves",
                Some("2024-04-30T18:00:00Z"),
                noon + 1_800,
                noon - 12 * 3_600,
                noon + 1_800,
            ),
            ("garbage in status: due now", Some("soon"), noon, noon, noon),
        ];
        for (name, last, now, next, recorded) in cases {
            let due = next_due(last, 6 * 3_600, now);
            assert_eq!(due, next, "{name}");
            assert_eq!(due_time_to_record(due, 6 * 3_600, now), recorded, "{name}");
        }
    }
}
