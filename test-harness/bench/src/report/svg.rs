//! A plotters backend that writes SVG text, for the charts whose readers want text that needs
//! no font where they are drawn: plotters lays the chart out (axes, ticks, coordinates), this
//! backend only writes each primitive as an SVG element.
//!
//! Not plotters' own `SVGBackend` (feature `svg_backend`): that one asks the font for every
//! text's size, so without DejaVu Sans on the machine the chart would lose its text; here text
//! is sized by estimate ([`SvgBackend::estimate_text_size`]) and the viewer draws it.

use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
    FontTransform,
};
use std::convert::Infallible;
use std::fmt::Write as _;

/// Average advance of a DejaVu Sans glyph, in em: how wide text is estimated to be.
const GLYPH_EM: f64 = 0.6;

/// Writes the chart into `out` as one SVG document (closed by `present`).
pub struct SvgBackend<'a> {
    out: &'a mut String,
    size: (u32, u32),
    closed: bool,
}

impl<'a> SvgBackend<'a> {
    /// A `size` (width, height) document on a white-less canvas (fill it to get a background).
    pub fn new(out: &'a mut String, size: (u32, u32)) -> Self {
        let (w, h) = size;
        let _ = writeln!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, sans-serif\">"
        );
        SvgBackend {
            out,
            size,
            closed: false,
        }
    }
}

/// `fill="#rrggbb"` or `stroke="#rrggbb"`, with the opacity when not opaque.
fn paint(attr: &str, c: BackendColor) -> String {
    let (r, g, b) = c.rgb;
    let mut s = format!("{attr}=\"#{r:02x}{g:02x}{b:02x}\"");
    if c.alpha < 1.0 {
        let _ = write!(s, " {attr}-opacity=\"{:.2}\"", c.alpha);
    }
    s
}

/// Text for an SVG element's content.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn points(path: impl IntoIterator<Item = BackendCoord>) -> String {
    let p: Vec<String> = path.into_iter().map(|(x, y)| format!("{x},{y}")).collect();
    p.join(" ")
}

impl DrawingBackend for SvgBackend<'_> {
    type ErrorType = Infallible;

    fn get_size(&self) -> (u32, u32) {
        self.size
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Infallible>> {
        Ok(())
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Infallible>> {
        if !self.closed {
            self.out.push_str("</svg>\n");
            self.closed = true;
        }
        Ok(())
    }

    fn draw_pixel(
        &mut self,
        (x, y): BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Infallible>> {
        if color.alpha > 0.0 {
            let _ = writeln!(
                self.out,
                "<rect x=\"{x}\" y=\"{y}\" width=\"1\" height=\"1\" {}/>",
                paint("fill", color)
            );
        }
        Ok(())
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        (x1, y1): BackendCoord,
        (x2, y2): BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Infallible>> {
        if style.color().alpha > 0.0 {
            let _ = writeln!(
                self.out,
                "<line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" {} stroke-width=\"{}\"/>",
                paint("stroke", style.color()),
                style.stroke_width()
            );
        }
        Ok(())
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        (x0, y0): BackendCoord,
        (x1, y1): BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Infallible>> {
        if style.color().alpha > 0.0 {
            let look = if fill {
                paint("fill", style.color())
            } else {
                format!("fill=\"none\" {}", paint("stroke", style.color()))
            };
            let _ = writeln!(
                self.out,
                "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{}\" {look}/>",
                x1 - x0,
                y1 - y0
            );
        }
        Ok(())
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Infallible>> {
        if style.color().alpha > 0.0 {
            let _ = writeln!(
                self.out,
                "<polyline points=\"{}\" fill=\"none\" {} stroke-width=\"{}\"/>",
                points(path),
                paint("stroke", style.color()),
                style.stroke_width()
            );
        }
        Ok(())
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        (cx, cy): BackendCoord,
        r: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Infallible>> {
        if style.color().alpha > 0.0 {
            let look = if fill {
                paint("fill", style.color())
            } else {
                format!("fill=\"none\" {}", paint("stroke", style.color()))
            };
            let _ = writeln!(
                self.out,
                "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"{r}\" {look}/>"
            );
        }
        Ok(())
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Infallible>> {
        if style.color().alpha > 0.0 {
            let _ = writeln!(
                self.out,
                "<polygon points=\"{}\" {}/>",
                points(path),
                paint("fill", style.color())
            );
        }
        Ok(())
    }

    fn draw_text<T: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &T,
        (x, y): BackendCoord,
    ) -> Result<(), DrawingErrorKind<Infallible>> {
        if style.color().alpha <= 0.0 {
            return Ok(());
        }
        let anchor = match style.anchor().h_pos {
            HPos::Left => "start",
            HPos::Center => "middle",
            HPos::Right => "end",
        };
        // plotters places text by its box; SVG by its baseline.
        let dy = match style.anchor().v_pos {
            VPos::Top => "0.8em",
            VPos::Center => "0.35em",
            VPos::Bottom => "0",
        };
        let turn = match style.transform() {
            FontTransform::Rotate90 => format!(" transform=\"rotate(90 {x} {y})\""),
            FontTransform::Rotate180 => format!(" transform=\"rotate(180 {x} {y})\""),
            FontTransform::Rotate270 => format!(" transform=\"rotate(270 {x} {y})\""),
            FontTransform::None => String::new(),
        };
        let _ = writeln!(
            self.out,
            "<text x=\"{x}\" y=\"{y}\" dy=\"{dy}\" text-anchor=\"{anchor}\" font-size=\"{}\" {}{turn}>{}</text>",
            style.size(),
            paint("fill", style.color()),
            escape(text)
        );
        Ok(())
    }

    /// Estimated, not measured: [`GLYPH_EM`] per character, one em high.
    fn estimate_text_size<T: BackendTextStyle>(
        &self,
        text: &str,
        style: &T,
    ) -> Result<(u32, u32), DrawingErrorKind<Infallible>> {
        let em = style.size();
        let w = (text.chars().count() as f64 * em * GLYPH_EM).ceil() as u32;
        Ok((w, em.ceil() as u32))
    }
}
