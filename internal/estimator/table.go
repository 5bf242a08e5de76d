package estimator

import "container/list"

// table is a bounded map of learned ratios whose entries each belong to one tenant. Beyond its
// bound it forgets the least recently used entry of a tenant holding its fair share (the bound
// divided among the tenants present, the inserting one included) or more: the inserting
// tenant's own when it holds that much. A tenant that makes up model names on a gateway taking
// any forgets its own entries, never those of a tenant holding less than its share. Not safe for
// concurrent use (Estimator.mu guards it).
type table struct {
	max      int
	entries  map[key]*list.Element // of *entry
	byTenant map[string]*list.List // each tenant's entries, most recently used first
}

type entry struct {
	k     key
	owner string
	ratio float64
}

func newTable(max int) *table {
	return &table{max: max, entries: make(map[key]*list.Element), byTenant: make(map[string]*list.List)}
}

// get returns k's ratio and marks it used.
func (t *table) get(k key) (float64, bool) {
	el, ok := t.entries[k]
	if !ok {
		return 0, false
	}
	t.byTenant[el.Value.(*entry).owner].MoveToFront(el)
	return el.Value.(*entry).ratio, true
}

// set sets k's ratio and marks it used; a new k belongs to owner and, at the bound, first
// forgets an entry (see table).
func (t *table) set(k key, owner string, ratio float64) {
	if el, ok := t.entries[k]; ok {
		el.Value.(*entry).ratio = ratio
		t.byTenant[el.Value.(*entry).owner].MoveToFront(el)
		return
	}
	if len(t.entries) >= t.max {
		t.evict(owner)
	}
	l := t.byTenant[owner]
	if l == nil {
		l = list.New()
		t.byTenant[owner] = l
	}
	t.entries[k] = l.PushFront(&entry{k: k, owner: owner, ratio: ratio})
}

// evict forgets the least recently used entry of owner when it holds its fair share or more,
// else of the first tenant found that does (one does: the entries' average is at least the
// share).
func (t *table) evict(owner string) {
	tenants := len(t.byTenant)
	if t.byTenant[owner] == nil {
		tenants++ // owner is about to hold one
	}
	fair := func(l *list.List) bool { return l != nil && l.Len()*tenants >= t.max }
	victim := t.byTenant[owner]
	if !fair(victim) {
		victim = nil
		for _, l := range t.byTenant {
			if victim == nil || l.Len() > victim.Len() {
				victim = l
			}
			if fair(l) {
				break
			}
		}
	}
	el := victim.Back()
	e := el.Value.(*entry)
	victim.Remove(el)
	delete(t.entries, e.k)
	if victim.Len() == 0 {
		delete(t.byTenant, e.owner)
	}
}
