//! SVG charts (plotters): horizontal bars, a heat table and lines over time. Deterministic for
//! the same data.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// A chart to write: file name and SVG text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chart {
    /// File name (no directory).
    pub file: String,
    /// SVG document.
    pub svg: String,
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing chart: {e:?}")
}

const BAR: RGBColor = RGBColor(0x3b, 0x6e, 0xa8);

/// Horizontal bars, one per label, values on the x axis.
pub fn bars(
    file: &str,
    title: &str,
    x_desc: &str,
    labels: &[String],
    values: &[f64],
) -> Result<Chart> {
    let n = labels.len().min(values.len());
    let height = 90 + 28 * n as u32;
    let max = values
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let xmax = if max > 0.0 { max * 1.1 } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(300)
            .build_cartesian_2d(0f64..xmax, (0..n).into_segmented())
            .map_err(err)?;
        let fmt_label = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.max(1))
            .y_label_formatter(&fmt_label)
            .x_desc(x_desc)
            .x_label_formatter(&|x| fmt_axis(*x))
            .draw()
            .map_err(err)?;
        // Rectangles in data order (plotters' Histogram series goes through a HashMap, whose
        // order, and so the SVG's bytes, changes from run to run).
        chart
            .draw_series(values.iter().take(n).enumerate().map(|(i, &v)| {
                let mut r = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (v, SegmentValue::Exact(i + 1)),
                    ],
                    BAR.filled(),
                );
                r.set_margin(4, 4, 0, 0);
                r
            }))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(Chart {
        file: file.to_string(),
        svg,
    })
}

fn fmt_axis(x: f64) -> String {
    if x.abs() >= 1_000_000.0 {
        format!("{:.1}M", x / 1_000_000.0)
    } else if x.abs() >= 1_000.0 {
        format!("{:.0}k", x / 1_000.0)
    } else {
        format!("{x:.0}")
    }
}

/// A heat table: rows × columns of numbers (None: no data), shaded from white (0) to red (max).
pub fn heat_table(
    file: &str,
    title: &str,
    row_labels: &[String],
    col_labels: &[String],
    cells: &[Vec<Option<f64>>],
) -> Result<Chart> {
    let (label_w, cell_w, cell_h, top) = (170i32, 130i32, 34i32, 70i32);
    let width = (label_w + cell_w * col_labels.len() as i32 + 20).max(360) as u32;
    let height = (top + cell_h * row_labels.len() as i32 + 20) as u32;
    let max = cells
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(0.0f64, f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let font = ("sans-serif", 14).into_font();
        root.draw(&Text::new(
            title.to_string(),
            (10, 10),
            ("sans-serif", 18).into_font(),
        ))
        .map_err(err)?;
        for (j, c) in col_labels.iter().enumerate() {
            let x = label_w + cell_w * j as i32 + 8;
            root.draw(&Text::new(c.clone(), (x, top - 22), font.clone()))
                .map_err(err)?;
        }
        for (i, r) in row_labels.iter().enumerate() {
            let y = top + cell_h * i as i32;
            root.draw(&Text::new(r.clone(), (10, y + 10), font.clone()))
                .map_err(err)?;
            for j in 0..col_labels.len() {
                let x = label_w + cell_w * j as i32;
                let v = cells.get(i).and_then(|row| row.get(j)).copied().flatten();
                let color = match v {
                    None => RGBColor(0xdd, 0xdd, 0xdd),
                    Some(v) => {
                        let t = if max > 0.0 {
                            (v / max).clamp(0.0, 1.0)
                        } else {
                            0.0
                        };
                        let fade = (255.0 * (1.0 - 0.75 * t)).round() as u8;
                        RGBColor(255, fade, fade)
                    }
                };
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell_w - 2, y + cell_h - 2)],
                    color.filled(),
                ))
                .map_err(err)?;
                let text = v.map_or("-".to_string(), |v| format!("{v:.0}"));
                root.draw(&Text::new(text, (x + 8, y + 10), font.clone()))
                    .map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(Chart {
        file: file.to_string(),
        svg,
    })
}

/// One line of a chart over time.
#[derive(Debug, Clone)]
pub struct Line {
    /// Legend label.
    pub label: String,
    /// Colour.
    pub color: RGBColor,
    /// Stroke width, px.
    pub width: u32,
    /// Drawn dashed (a secondary quantity).
    pub dashed: bool,
    /// (x, y) points in x order; `None` leaves a gap.
    pub points: Vec<(f64, Option<f64>)>,
}

/// The runs of points of `points` that have a value, a run broken where more than `bridge`
/// points in a row have none.
fn segments(points: &[(f64, Option<f64>)], bridge: usize) -> Vec<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    let mut run = Vec::new();
    let mut missing = 0;
    for &(x, y) in points {
        match y.filter(|y| y.is_finite()) {
            Some(y) => {
                missing = 0;
                run.push((x, y));
            }
            None => {
                missing += 1;
                if missing > bridge && !run.is_empty() {
                    out.push(std::mem::take(&mut run));
                }
            }
        }
    }
    if !run.is_empty() {
        out.push(run);
    }
    out
}

/// Lines over time: x in seconds from `0` to `x_max`, y on a logarithmic axis from `y_min`
/// (values below it are drawn at it) to above the largest value; a labelled vertical mark at
/// each `(x, label)` of `marks`; the legend in a column on the right. A line bridges a gap
/// of up to `bridge` points without a value and breaks at a longer one.
#[allow(clippy::too_many_arguments)]
pub fn time_lines(
    file: &str,
    title: &str,
    y_desc: &str,
    x_max: f64,
    y_min: f64,
    bridge: usize,
    lines: &[Line],
    marks: &[(f64, String)],
) -> Result<Chart> {
    const LEGEND_W: i32 = 230;
    let (width, height) = (1000i32, 460i32);
    let y_top = lines
        .iter()
        .flat_map(|l| l.points.iter().filter_map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(y_min, f64::max)
        * 2.0;
    let grey = RGBColor(0x77, 0x77, 0x77);
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (width as u32, height as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .margin_right(LEGEND_W)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max.max(1.0), (y_min..y_top).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc(y_desc)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| fmt_axis(*y))
            .draw()
            .map_err(err)?;
        for (x, label) in marks {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(*x, y_min), (*x, y_top)],
                    grey.stroke_width(1),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    label.clone(),
                    (*x, y_top / 1.3),
                    ("sans-serif", 13).into_font().color(&grey),
                )))
                .map_err(err)?;
        }
        for l in lines {
            let style = l.color.stroke_width(l.width);
            for seg in segments(&l.points, bridge) {
                let seg: Vec<(f64, f64)> =
                    seg.into_iter().map(|(x, y)| (x, y.max(y_min))).collect();
                if l.dashed {
                    chart
                        .draw_series(DashedLineSeries::new(seg, 6, 4, style))
                        .map_err(err)?;
                } else {
                    chart
                        .draw_series(LineSeries::new(seg, style))
                        .map_err(err)?;
                }
            }
        }
        // The legend, beside the plot so that it hides no data.
        let x0 = width - LEGEND_W + 10;
        for (i, l) in lines.iter().enumerate() {
            let y = 60 + 22 * i as i32;
            let style = l.color.stroke_width(l.width);
            let dash: &[(i32, i32)] = if l.dashed {
                &[(0, 7), (11, 18), (22, 28)]
            } else {
                &[(0, 28)]
            };
            for &(a, b) in dash {
                root.draw(&PathElement::new(vec![(x0 + a, y), (x0 + b, y)], style))
                    .map_err(err)?;
            }
            root.draw(&Text::new(
                l.label.clone(),
                (x0 + 36, y - 7),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(Chart {
        file: file.to_string(),
        svg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_deterministic_svg() {
        let l: Vec<String> = (0..12).map(|i| format!("bar {i}")).collect();
        let v: Vec<f64> = (0..12).map(|i| f64::from(i) * 10.0 + 1.0).collect();
        let a = bars("x.svg", "t", "rt/s", &l, &v).unwrap();
        for _ in 0..5 {
            assert_eq!(a, bars("x.svg", "t", "rt/s", &l, &v).unwrap());
        }
        let l = vec!["a".to_string(), "b".to_string()];
        let a = bars("x.svg", "t", "rt/s", &l, &[1.0, 2.0]).unwrap();
        assert!(a.svg.starts_with("<svg"));
        assert!(a.svg.contains("\na\n</text>"), "{}", a.svg);
    }

    #[test]
    fn heat_table_shows_values_and_gaps() {
        let c = heat_table(
            "h.svg",
            "loss",
            &["1,472".into()],
            &["w1".into(), "w16".into()],
            &[vec![Some(0.0), None]],
        )
        .unwrap();
        assert!(c.svg.contains("\n0\n</text>"), "{}", c.svg);
        assert!(c.svg.contains("\n-\n</text>"), "{}", c.svg);
    }

    #[test]
    fn time_lines_break_at_gaps_and_are_deterministic() {
        assert_eq!(
            segments(
                &[
                    (0.0, Some(1.0)),
                    (1.0, None),
                    (2.0, Some(2.0)),
                    (3.0, Some(3.0))
                ],
                0
            ),
            vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]
        );
        // A gap of one point is bridged when asked, one of two is not.
        let p = [
            (0.0, Some(1.0)),
            (1.0, None),
            (2.0, Some(2.0)),
            (3.0, None),
            (4.0, None),
            (5.0, Some(5.0)),
        ];
        assert_eq!(
            segments(&p, 1),
            vec![vec![(0.0, 1.0), (2.0, 2.0)], vec![(5.0, 5.0)]]
        );
        let line = |label: &str, dashed| Line {
            label: label.into(),
            color: BAR,
            width: 2,
            dashed,
            points: (0..50)
                .map(|i| {
                    (
                        f64::from(i) / 10.0,
                        (i % 7 != 0).then(|| f64::from(i) + 20.0),
                    )
                })
                .collect(),
        };
        let draw = || {
            time_lines(
                "t.svg",
                "over time",
                "ms",
                5.0,
                1.0,
                1,
                &[line("event", false), line("queue", true)],
                &[(2.5, "step".into())],
            )
            .unwrap()
        };
        let a = draw();
        assert_eq!(a, draw());
        assert!(a.svg.contains("event") && a.svg.contains("queue"));
        assert!(a.svg.contains("step"));
    }
}
