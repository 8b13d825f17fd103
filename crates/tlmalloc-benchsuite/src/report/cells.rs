//! How a figure is written in the report's tables: the cell of a median
//! (with its min–max and its ratio to tlmalloc), the ↑/↓ of a figure, and
//! the label of a case.

use crate::charts::short;
use crate::stats::Summary;
use crate::workloads::Metric;

/// The value of a summary for display.
pub(super) fn shown(v: f64, m: &Metric) -> String {
    short(v / m.divisor)
}

/// A table cell: the median, then min–max and the ratio to tlmalloc.
pub(super) fn cell(s: Option<&Summary>, m: &Metric, base: bool) -> String {
    let Some(s) = s else { return "–".into() };
    let range = format!("{}–{}", shown(s.min, m), shown(s.max, m));
    match (base, s.vs_tlmalloc) {
        (false, Some(r)) => format!(
            "{}<br><sub>{range} · {}×</sub>",
            shown(s.median, m),
            short(r)
        ),
        _ => format!("**{}**<br><sub>{range}</sub>", shown(s.median, m)),
    }
}

pub(super) fn arrow(m: &Metric) -> &'static str {
    if m.higher_is_better {
        "↑"
    } else {
        "↓"
    }
}

/// A case's label: `T=2`, `T=1 size=64`.
pub(super) fn case_label(threads: usize, param: &str) -> String {
    if param.is_empty() {
        format!("T={threads}")
    } else {
        format!("T={threads} {param}")
    }
}
