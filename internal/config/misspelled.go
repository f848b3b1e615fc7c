package config

import (
	"slices"
	"strings"
)

// maxTypoDistance is the most edits (Damerau-Levenshtein, optimal string
// alignment) between a variable's name and a setting's for the variable to
// count as a misspelling of the setting.
const maxTypoDistance = 2

// Misspelled returns, for each of names (variable names, as the part of
// os.Environ's entries before '=') that is no setting but looks like a
// misspelling of one, the setting it probably stands for, by name. A
// variable looks like a misspelling of a setting when it is at most
// maxTypoDistance edits from the setting's name and its first word (up to
// the first '_') is the setting's, or one edit from it, as RECIEPT_POLICY.
// A name in a family of Settings (OTEL_*) is a setting, and a name whose
// first word is more than one edit from every setting's (PATH, PGHOST,
// GOFLAGS) is never a misspelling.
func Misspelled(names []string) map[string]string {
	out := map[string]string{}
	for _, name := range names {
		if known(name) {
			continue
		}
		if meant := closest(name); meant != "" {
			out[name] = meant
		}
	}
	return out
}

// known reports whether name is a setting or in a family of them.
func known(name string) bool {
	return slices.ContainsFunc(Settings, func(s Setting) bool {
		family, isFamily := strings.CutSuffix(s.Env, "*")
		return s.Env == name || isFamily && strings.HasPrefix(name, family)
	})
}

// closest returns the setting name is a likely misspelling of, the nearest
// one, or "".
func closest(name string) string {
	best, bestDist := "", maxTypoDistance+1
	for _, s := range Settings {
		if strings.HasSuffix(s.Env, "*") || editDistance(firstWord(name), firstWord(s.Env)) > 1 {
			continue
		}
		if d := editDistance(name, s.Env); d < bestDist {
			best, bestDist = s.Env, d
		}
	}
	return best
}

// firstWord returns name up to its first '_', or all of it.
func firstWord(name string) string {
	word, _, _ := strings.Cut(name, "_")
	return word
}

// editDistance returns the optimal string alignment distance between a
// and b: the fewest insertions, deletions, substitutions and swaps of two
// adjacent bytes that turn a into b, no substring edited twice.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
