//! [`SlurmTime`]: a Slurm `--time` value, parsed once into a duration.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A Slurm time limit (`sbatch --time`), in any of Slurm's forms: `M`, `M:S`, `H:M:S`, `D-H`,
/// `D-H:M`, `D-H:M:S` (see `man sbatch`, `--time`). Each field is 1 to 6 digits.
///
/// Kept both as written (what `#SBATCH --time=` gets, so the script says what the config
/// said) and as a [`Duration`] (what the controller and node-hour totals use). Serialized as
/// the text; deserializing parses it again.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlurmTime {
    text: String,
    duration: Duration,
}

/// Why a string is not a Slurm time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a Slurm time ({})", .reason.expected())]
#[non_exhaustive]
pub struct SlurmTimeError {
    /// The text refused.
    pub text: String,
    /// What is wrong with it.
    pub reason: SlurmTimeReason,
}

/// What is wrong with a refused Slurm time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlurmTimeReason {
    /// Not in Slurm's grammar.
    Syntax,
    /// A zero total (`0:0:0`, `00:00`, `0-0`): Slurm reads a zero limit as no limit at all.
    Zero,
    /// A field out of its range: minutes or seconds after the first field outside 0..59,
    /// hours after days outside 0..23.
    OutOfRange,
}

impl SlurmTimeReason {
    /// What was expected instead, as the errors say it.
    pub fn expected(self) -> &'static str {
        match self {
            SlurmTimeReason::Syntax => {
                "expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S, e.g. \"4:00:00\" or \"1-00:00:00\""
            }
            SlurmTimeReason::Zero => {
                "expected a positive time limit: Slurm reads a zero limit as no limit at all"
            }
            SlurmTimeReason::OutOfRange => {
                "expected minutes and seconds in 0..59 after the first field, and hours in 0..23 after days"
            }
        }
    }
}

impl SlurmTime {
    /// The limit as a duration.
    pub fn as_duration(&self) -> Duration {
        self.duration
    }

    /// The limit as written in the config.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// A limit of `minutes` (written as minutes, Slurm's plain-number form).
    pub fn from_minutes(minutes: u32) -> Self {
        SlurmTime {
            text: minutes.to_string(),
            duration: Duration::from_secs(u64::from(minutes) * 60),
        }
    }
}

impl FromStr for SlurmTime {
    type Err = SlurmTimeError;
    /// Parses Slurm's grammar and checks the fields as Slurm would: the first field is
    /// unbounded (`90` or `90:00` are 90 minutes, `30:00:00` is 30 hours), minutes and seconds
    /// after it are 0..59, hours after days 0..23; a zero total is refused (Slurm reads it as
    /// no limit).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| SlurmTimeError {
            text: s.to_string(),
            reason,
        };
        let bad = || err(SlurmTimeReason::Syntax);
        let num = |x: &str| -> Option<u64> {
            if x.is_empty() || x.len() > 6 || !x.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            x.parse().ok()
        };
        let (days, rest) = match s.split_once('-') {
            Some((d, r)) => (Some(num(d).ok_or_else(bad)?), r),
            None => (None, s),
        };
        let parts: Vec<u64> = rest
            .split(':')
            .map(num)
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        // (hours, minutes, seconds) and whether each is bounded: a field is unbounded only
        // when it comes first (no days before it).
        let (h, m, sec) = match (days.is_some(), parts.as_slice()) {
            (false, [m]) => (0, *m, 0),
            (false, [m, sec]) => (0, *m, *sec),
            (_, [h, m, sec]) => (*h, *m, *sec),
            (true, [h]) => (*h, 0, 0),
            (true, [h, m]) => (*h, *m, 0),
            _ => return Err(bad()),
        };
        let minutes_lead = days.is_none() && parts.len() < 3;
        if (days.is_some() && h > 23) || (!minutes_lead && m > 59) || sec > 59 {
            return Err(err(SlurmTimeReason::OutOfRange));
        }
        let total = days.unwrap_or(0) * 86_400 + h * 3600 + m * 60 + sec;
        if total == 0 {
            return Err(err(SlurmTimeReason::Zero));
        }
        Ok(SlurmTime {
            text: s.to_string(),
            duration: Duration::from_secs(total),
        })
    }
}

impl fmt::Display for SlurmTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for SlurmTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// What [`SlurmTime`]'s `Deserialize` accepts, as its errors say it.
const EXPECTED: &str = "a Slurm time M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. \"4:00:00\" or \"1-00:00:00\"), or a positive number of minutes below 1000000";

/// What an out-of-range Slurm time was expected to be.
const OUT_OF_RANGE: &str = "a Slurm time M, M:S, H:M:S, D-H, D-H:M or D-H:M:S with minutes and seconds in 0..59 after the first field and hours in 0..23 after days (e.g. \"1:30:00\", \"1-23:59:59\")";

/// Accepts a string in Slurm's grammar or a positive integer (minutes, as `--time=30`); parsed
/// here, once. A refused value is reported with serde's `invalid_value`: the value and the
/// grammar expected.
impl<'de> serde::Deserialize<'de> for SlurmTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Unexpected;
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = SlurmTime;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<SlurmTime, E> {
                s.parse().map_err(|e: SlurmTimeError| match e.reason {
                    // A zero total gets the message of a plain `0`.
                    SlurmTimeReason::Syntax | SlurmTimeReason::Zero => {
                        E::invalid_value(Unexpected::Str(s), &self)
                    }
                    SlurmTimeReason::OutOfRange => {
                        E::invalid_value(Unexpected::Str(s), &OUT_OF_RANGE)
                    }
                })
            }
            fn visit_u64<E: serde::de::Error>(self, m: u64) -> Result<SlurmTime, E> {
                match u32::try_from(m) {
                    Ok(m) if m > 0 && m < 1_000_000 => Ok(SlurmTime::from_minutes(m)),
                    _ => Err(E::invalid_value(Unexpected::Unsigned(m), &self)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, m: i64) -> Result<SlurmTime, E> {
                match u64::try_from(m) {
                    Ok(m) => self.visit_u64(m),
                    Err(_) => Err(E::invalid_value(Unexpected::Signed(m), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> Option<u64> {
        s.parse::<SlurmTime>()
            .ok()
            .map(|t| t.as_duration().as_secs())
    }

    #[test]
    fn every_slurm_form_parses_to_its_duration() {
        assert_eq!(secs("30"), Some(1800));
        assert_eq!(secs("30:15"), Some(1815));
        assert_eq!(secs("01:30:00"), Some(5400));
        assert_eq!(secs("4:00:00"), Some(14400));
        assert_eq!(secs("2-00:00:00"), Some(172_800));
        assert_eq!(secs("1-2"), Some(93_600));
        assert_eq!(secs("1-2:30"), Some(95_400));
        let t: SlurmTime = "4:00:00".parse().unwrap();
        assert_eq!(t.to_string(), "4:00:00");
    }

    #[test]
    fn malformed_times_are_refused_not_dropped() {
        for bad in [
            "",
            "x",
            "1:2:3:4",
            "-1",
            "1-",
            "1--2",
            "1.5",
            "1234567",
            "4h",
            "1-2:3:4:5",
            " 30",
        ] {
            let e = bad.parse::<SlurmTime>().unwrap_err();
            assert_eq!(e.text, bad);
            assert!(e.to_string().contains("not a Slurm time"), "{e}");
        }
    }

    #[test]
    fn zero_totals_are_refused_in_every_form() {
        for zero in [
            "0", "00", "0:0", "00:00", "0:0:0", "00:00:00", "0-0", "0-0:0", "0-0:0:0",
        ] {
            let e = zero.parse::<SlurmTime>().unwrap_err();
            assert_eq!(e.reason, SlurmTimeReason::Zero, "{zero}");
            assert!(e.to_string().contains("no limit"), "{e}");
            // Through serde: the message of a plain `0`.
            let json = serde_json::to_string(zero).unwrap();
            let m = serde_json::from_str::<SlurmTime>(&json)
                .unwrap_err()
                .to_string();
            assert!(m.contains(EXPECTED), "{m}");
        }
        let m = serde_json::from_str::<SlurmTime>("0")
            .unwrap_err()
            .to_string();
        assert!(m.contains(EXPECTED), "{m}");
        // A few seconds are not zero.
        assert_eq!(secs("0:01"), Some(1));
        assert_eq!(secs("0-0:0:1"), Some(1));
    }

    #[test]
    fn fields_after_the_first_are_range_checked() {
        for bad in [
            "25:99",
            "1:61:00",
            "1:00:60",
            "0:60",
            "1-24",
            "1-24:00",
            "1-0:60",
            "1-0:0:60",
            "2-99:00:00",
        ] {
            let e = bad.parse::<SlurmTime>().unwrap_err();
            assert_eq!(e.reason, SlurmTimeReason::OutOfRange, "{bad}");
            let json = serde_json::to_string(bad).unwrap();
            let m = serde_json::from_str::<SlurmTime>(&json)
                .unwrap_err()
                .to_string();
            assert!(m.contains(bad) && m.contains("0..59"), "{m}");
        }
        // The first field is unbounded: 90 minutes, 90 minutes and 30 seconds, 30 hours.
        assert_eq!(secs("90"), Some(5400));
        assert_eq!(secs("90:30"), Some(5430));
        assert_eq!(secs("30:00:00"), Some(108_000));
        assert_eq!(secs("1-23:59:59"), Some(172_799));
        assert_eq!(secs("0:59:59"), Some(3599));
    }

    #[test]
    fn serde_round_trips_as_text_and_accepts_minutes() {
        let t: SlurmTime = serde_json::from_str("\"1-00:00:00\"").unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"1-00:00:00\"");
        let m: SlurmTime = serde_json::from_str("90").unwrap();
        assert_eq!(m.as_duration().as_secs(), 5400);
        assert!(serde_json::from_str::<SlurmTime>("0").is_err());
        let e = serde_json::from_str::<SlurmTime>("\"4h\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"4h\"") && e.contains("M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"),
            "{e}"
        );
        assert!(serde_json::from_str::<SlurmTime>("-5").is_err());
        assert!(serde_json::from_str::<SlurmTime>("1000000").is_err());
    }
}
