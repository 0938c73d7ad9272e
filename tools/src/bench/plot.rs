//! `--plot FILE.svg`: a benchmark's figure drawn with plotters (SVG, text
//! left to the viewer's fonts).

use std::path::Path;

use plotters::prelude::*;

use crate::bench::am::{AmHotspotResult, AmLogPResult, HotspotFigure};

const SIZE: (u32, u32) = (800, 520);
const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

/// An axis value without trailing zeros, large ones in k and M.
fn compact(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    match v.abs() {
        a if a >= 1e6 => format!("{}M", trim(format!("{:.2}", v / 1e6))),
        a if a >= 1e4 => format!("{}k", trim(format!("{:.1}", v / 1e3))),
        _ => trim(format!("{v:.2}")),
    }
}

/// Lines against a shared x axis: `series` as (label, points).
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.1.iter().map(|p| p.1));
    let x_max = xs.fold(1.0, f64::max);
    let y_max = ys.fold(0.0, f64::max).max(1e-9) * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| compact(*x))
        .y_label_formatter(&|y| compact(*y))
        .draw()
        .map_err(err)?;
    for (i, (label, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// VN Fig. 5: o_s, o_r, g, L and RTT as grouped bars, one colour per case.
pub fn logp(path: &Path, results: &[AmLogPResult]) -> anyhow::Result<()> {
    let names = ["o_s", "o_r", "g", "L", "RTT"];
    let value = |r: &AmLogPResult, i: usize| [r.o_s_us, r.o_r_us, r.g_us, r.l_us, r.rtt_us][i];
    let y_max = results
        .iter()
        .flat_map(|r| (0..names.len()).map(move |i| value(r, i)))
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.15;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "VN Fig. 5: LogP of a 4-word AM request and reply (ulnic::am)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5f64..names.len() as f64 - 0.5, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            match names.get(i as usize) {
                Some(n) if (x - i).abs() < 0.01 && i >= 0.0 => n.to_string(),
                _ => String::new(),
            }
        })
        .y_label_formatter(&|y| compact(*y))
        .y_desc("microseconds")
        .draw()
        .map_err(err)?;
    let width = 0.8 / results.len().max(1) as f64;
    for (c, r) in results.iter().enumerate() {
        let colour = COLOURS[c % COLOURS.len()];
        chart
            .draw_series((0..names.len()).map(|i| {
                let x0 = i as f64 - 0.4 + c as f64 * width;
                Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.9, value(r, i))],
                    colour.filled(),
                )
            }))
            .map_err(err)?
            .label(r.case.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// VN Figs. 7, 8 and 9 from the hot spot's results.
pub fn hotspot(
    path: &Path,
    figure: HotspotFigure,
    results: &[AmHotspotResult],
) -> anyhow::Result<()> {
    let n = |r: &AmHotspotResult| f64::from(r.clients);
    let per_client = |r: &AmHotspotResult, pick: fn(f64, f64) -> f64, start: f64| {
        r.per_client_per_s.iter().copied().fold(start, pick)
    };
    let series = |f: &dyn Fn(&AmHotspotResult) -> f64| -> Vec<(f64, f64)> {
        results.iter().map(|r| (n(r), f(r))).collect()
    };
    match figure {
        HotspotFigure::Rate => lines(
            path,
            "VN Fig. 7: N clients, 4-word requests and replies, one server endpoint",
            "clients",
            "requests per second",
            &[
                ("aggregate".into(), series(&|r| r.aggregate_per_s)),
                (
                    "fastest client".into(),
                    series(&|r| per_client(r, f64::max, 0.0)),
                ),
                (
                    "slowest client".into(),
                    series(&|r| per_client(r, f64::min, f64::MAX)),
                ),
            ],
        ),
        HotspotFigure::Bulk => {
            let mb = |r: &AmHotspotResult, x: f64| {
                x * r.aggregate_mbytes_per_s / r.aggregate_per_s.max(1e-9)
            };
            lines(
                path,
                "VN Fig. 8: N clients, 1 KB bulk requests and 4-word replies, one server endpoint",
                "clients",
                "MB/s (10^6)",
                &[
                    ("aggregate".into(), series(&|r| r.aggregate_mbytes_per_s)),
                    (
                        "fastest client".into(),
                        series(&|r| mb(r, per_client(r, f64::max, 0.0))),
                    ),
                    (
                        "slowest client".into(),
                        series(&|r| mb(r, per_client(r, f64::min, f64::MAX))),
                    ),
                ],
            )
        }
        HotspotFigure::Rtt => lines(
            path,
            "VN Fig. 9: round trip of a 4-word request and reply against N clients",
            "clients",
            "microseconds",
            &[
                ("median".into(), series(&|r| r.rtt_median_us)),
                ("95th percentile".into(), series(&|r| r.rtt_p95_us)),
            ],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_values_are_compact() {
        assert_eq!(compact(1_800_000.0), "1.8M");
        assert_eq!(compact(250_000.0), "250k");
        assert_eq!(compact(12.5), "12.5");
        assert_eq!(compact(40.0), "40");
        assert_eq!(compact(0.0), "0");
    }

    #[test]
    fn figures_are_svg_with_their_labels() {
        let dir = tempfile::tempdir().unwrap();
        let f5 = dir.path().join("f5.svg");
        let r = AmLogPResult {
            bench: "am-logp",
            figure: "VN Fig. 5",
            case: "ideal fabric".into(),
            o_s_us: 1.0,
            o_r_us: 2.0,
            g_us: 3.0,
            l_us: 4.0,
            rtt_us: 14.0,
            rtt_p95_us: 20.0,
        };
        logp(&f5, &[r]).unwrap();
        let svg = std::fs::read_to_string(&f5).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("VN Fig. 5"));
        assert!(
            svg.contains(">\no_s\n<") && svg.contains("ideal fabric"),
            "{svg}"
        );
        let f9 = dir.path().join("f9.svg");
        let h = AmHotspotResult {
            bench: "am-rtt",
            figure: "VN Fig. 9",
            clients: 4,
            aggregate_per_s: 100.0,
            aggregate_mbytes_per_s: 0.0,
            per_client_per_s: vec![25.0; 4],
            min_share_x_n: 1.0,
            max_share_x_n: 1.0,
            jain: 1.0,
            rtt_median_us: 30.0,
            rtt_p95_us: 45.0,
            seconds: 1.0,
        };
        hotspot(&f9, HotspotFigure::Rtt, &[h]).unwrap();
        let svg = std::fs::read_to_string(&f9).unwrap();
        assert!(svg.contains("VN Fig. 9") && svg.contains("95th percentile"));
        assert!(svg.contains("<polyline") || svg.contains("<path"), "{svg}");
    }
}
