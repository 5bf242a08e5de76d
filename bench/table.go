package main

import "strings"

// textTable aligns rows under header: the first column left-aligned, the others right-aligned,
// columns separated by two spaces, trailing spaces trimmed.
func textTable(header []string, rows [][]string) string {
	width := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(row []string) {
		var l strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i > 0 {
				l.WriteString("  ")
			}
			if i == 0 {
				l.WriteString(c + pad)
			} else {
				l.WriteString(pad + c)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	line(header)
	rule := make([]string, len(header))
	for i := range rule {
		rule[i] = strings.Repeat("-", width[i])
	}
	line(rule)
	for _, row := range rows {
		line(row)
	}
	return b.String()
}

// markdownTable renders rows as a GitHub Markdown table, numbers right-aligned. Pipes in cells
// are escaped.
func markdownTable(header []string, rows [][]string) string {
	var b strings.Builder
	esc := func(row []string) string {
		out := make([]string, len(row))
		for i, c := range row {
			out[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		return "| " + strings.Join(out, " | ") + " |\n"
	}
	b.WriteString(esc(header))
	align := make([]string, len(header))
	for i := range align {
		align[i] = "---:"
	}
	align[0] = "---"
	b.WriteString("|" + strings.Join(align, "|") + "|\n")
	for _, row := range rows {
		b.WriteString(esc(row))
	}
	return b.String()
}
