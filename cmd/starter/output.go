package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// writeJSON writes v to w as indented JSON. Beyond what encoding/json
// escapes (control characters, invalid UTF-8), it writes every character a
// terminal would act on or hide, such as U+202E or a zero-width space, as a
// \u escape: non-ASCII characters only occur inside JSON strings, so the
// output stays valid JSON with the same values.
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r >= utf8.RuneSelf && !printable(r):
			for _, u := range utf16(r) {
				fmt.Fprintf(&out, `\u%04x`, u)
			}
		default:
			out.Write(b[:size])
		}
		b = b[size:]
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

func utf16(r rune) []rune {
	if r < 0x10000 {
		return []rune{r}
	}
	r -= 0x10000
	return []rune{0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff}
}

// printable reports whether a terminal shows r as itself: a letter, mark,
// number, punctuation, symbol or the ASCII space, and not a control,
// format (such as U+202E or U+200B), separator or private-use character.
func printable(r rune) bool {
	return strconv.IsPrint(r) && !unicode.Is(unicode.Cf, r)
}

// clean returns s as a terminal may show it: unchanged when every
// character is printable, else quoted as a Go string literal, so that
// control and format characters appear as escapes such as \x1b or \u202e
// and cannot move the cursor, recolour or reorder the output. A value
// starting with a double quote is quoted too, so a quoted value is always
// an escaped one.
func clean(s string) string {
	if len(s) > 0 && s[0] == '"' {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r == utf8.RuneError || !printable(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
