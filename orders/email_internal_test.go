package orders

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// defaultIgnorableFile is the Default_Ignorable_Code_Point section of the
// Unicode Character Database's DerivedCoreProperties.txt for unicode.Version.
// When Go moves to a newer Unicode, add that version's section here.
const defaultIgnorableFile = "testdata/Default_Ignorable_Code_Point-" + unicode.Version + ".txt"

// TestDefaultIgnorableIsUnicodes checks the derivation in defaultIgnorable
// against Unicode's own list of the property, for every code point.
func TestDefaultIgnorableIsUnicodes(t *testing.T) {
	t.Parallel()
	f, err := os.Open(defaultIgnorableFile)
	require.NoError(t, err, "Go's unicode tables are version %s: add that version's Default_Ignorable_Code_Point section of DerivedCoreProperties.txt", unicode.Version)
	defer f.Close()
	want := map[rune]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		cps, prop, ok := strings.Cut(line, ";")
		if !ok {
			continue
		}
		require.Equal(t, "Default_Ignorable_Code_Point", strings.TrimSpace(prop))
		lo, hi, isRange := strings.Cut(strings.TrimSpace(cps), "..")
		if !isRange {
			hi = lo
		}
		from, err := strconv.ParseUint(lo, 16, 32)
		require.NoError(t, err)
		to, err := strconv.ParseUint(hi, 16, 32)
		require.NoError(t, err)
		for r := rune(from); r <= rune(to); r++ {
			want[r] = true
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, want)
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if defaultIgnorable(r) != want[r] {
			t.Fatalf("U+%04X: defaultIgnorable says %v, Unicode %s says %v", r, defaultIgnorable(r), unicode.Version, want[r])
		}
	}
	for _, r := range []rune{0xFE0F, 0x034F, 0x180B, 0x3164, 0xFFA0, 0x115F, 0x1160, 0x200B, 0x00AD} {
		require.True(t, defaultIgnorable(r), "U+%04X", r)
	}
	for _, r := range []rune{brailleBlank, 0x0301, 'a', ' ', 0x0600 /* ARABIC NUMBER SIGN: Prepended_Concatenation_Mark */, 0xFFF9} {
		require.False(t, defaultIgnorable(r), "U+%04X", r)
	}
}
